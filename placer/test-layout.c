#include <criterion/criterion.h>
Test(layout, placeholder) {}
